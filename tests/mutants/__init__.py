"""Must-fail mutants: vLLM's race classes reintroduced at the Session boundary.

See :mod:`mutants.catalogue` for the list, :mod:`mutants.plugin` to run any pytest suite
under one (``P2PFSM_MUTANT=NAME pytest -p mutants.plugin ...``) and ``python -m
tests.mutants`` for the table of which suites catch which mutant (docs/explanation/verification.md,
"Mutants"). The executor's slips are checked by ``tests/mutants/test_executor_slips.py``.
The mutation score (mutmut over the package, :mod:`mutants.toml_mutator` over the models)
is ``python -m tests.mutants.mutation`` (:mod:`mutants.mutation`; "Mutation score").
"""
