"""Run directories: how a run is started, kept, written and read back.

* :mod:`~contllm.rundir.runner`: the one lifecycle of every run (settings, model, items,
  records, results), :mod:`~contllm.rundir.distributed` its shards and processes and
  :mod:`~contllm.rundir.spec` multi-run TOML specs;
* :mod:`~contllm.rundir.runs`: the directory itself (config, records, shards, manifest,
  lock) and :mod:`~contllm.rundir.files` the one place a name becomes a path;
* :mod:`~contllm.rundir.outputs`: results.json, CSV tables, summary and figures;
* :mod:`~contllm.rundir.schemas`: the schema of every file read back;
* :mod:`~contllm.rundir.report`, :mod:`~contllm.rundir.explorer`,
  :mod:`~contllm.rundir.pages`: comparing runs, the explorer page and safe HTML.

Nothing is imported when the package is.
"""
