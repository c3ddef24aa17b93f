"""Read: input files into rows, each row checked; images fetched and bounded; repeated ids found.

The first step of a job (:func:`..run.run_batch`): nothing here needs the engine, so a dry run
(:mod:`..dry_run`) runs all of it.
"""
