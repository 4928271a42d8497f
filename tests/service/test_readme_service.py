"""The README's section on `tidelog serve` works as written: its curl commands (with curl
itself) against a live `tidelog serve`, their answers as the comments say, the SSE stream read
by curl, and the Python example through the remote backend (SVC-13, SVC-27, SVC-58)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _section() -> str:
    text = README.read_text()
    start = text.index("## The topics service (`tidelog serve`)")
    return text[start : text.index("\n## ", start + 10)]


def _commands(section: str) -> list[tuple[str, str | None]]:
    """Each curl command of the sh block (continuations joined) and the answer its comment
    promises, if any."""
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    joined = block.group(1).replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        if not line.startswith("curl"):
            continue
        command, _, comment = line.partition("  # ")
        promised = comment.strip() if comment.strip().startswith("{") else None
        out.append((command.strip(), promised))
    return out


def test_SVC_13_SVC_27_the_readme_service_section_runs_as_written(tmp_path: Path) -> None:
    assert shutil.which("curl"), "curl is needed to check the README's commands as written"
    section = _section()
    first = re.search(r"^tidelog serve (.*) &$", section, re.M)
    assert first is not None and "--port 9000" in first.group(1)
    argv = [sys.executable, "-m", "tidelog", "serve", "--uri", f"file://{tmp_path / 'store'}",
            "--port", "0"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=tmp_path, text=True, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        outputs = []
        for command, promised in _commands(section):
            command = command.replace("localhost:9000", f"127.0.0.1:{port}")
            result = subprocess.run(
                ["bash", "-c", command], capture_output=True, text=True, timeout=30
            )
            assert result.returncode in (0, 28), (command, result.stderr)  # 28: --max-time
            if promised is not None:
                assert result.stdout.strip() == promised, command
            outputs.append(result.stdout)
        assert len(outputs) == 8
        assert '"seq":1' in outputs[3] and '"seq":3' in outputs[3]  # the read
        events = outputs[4]
        assert '"items":[{"seq":1' in outputs[6]  # the poll
        assert outputs[7].strip() == '{"acked":3}'
        assert events.count("event: record") == 3 and "id: 3" in events  # the SSE stream
        block = re.search(r"```python\n(.*?)```", section, re.S)
        assert block is not None
        code = compile(block.group(1), "README.md service example", "exec")
        exec(code, {"__name__": "readme", "PORT": port})
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
