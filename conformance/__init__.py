"""tidelog.conformance: the kit other implementations use to prove they follow spec/SPEC.md
(spec/CONFORMANCE.md; how to use it: docs/conformance.md).

* ``suite.BackendSuite``: pytest base class for a Python backend (levels by capability).
* ``driver`` / ``remote`` / ``runner``: the JSON-lines driver protocol, tidelog's own driver,
  and ``tidelog conformance run``, for implementations in any language.
* ``machine.LogMachine`` (and ``suitemachine``, ``fsnmachine``, ``ringcheck``): the stateful
  suite against the model; ``invariants``: model-free checks of observable invariants.
* ``crashfs`` / ``crashcheck``: the recording FS seam and the power-loss checks.
* ``vectors``: golden vectors of every on-disk format (``tidelog conformance vectors``).

Everything but ``vectors``, ``crashfs`` and ``invariants`` needs ``tidelog[test]`` (Hypothesis).
"""
