"""tidelog.conformance: the kit other implementations use to prove they follow spec/SPEC.md.

``tidelog.conformance.machine.LogMachine`` is the stateful suite (needs ``tidelog[test]``:
Hypothesis). ``tidelog.conformance.invariants`` holds model-free checks of observable invariants.
"""
