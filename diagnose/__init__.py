"""`llmb-loadgen diagnose` and `compare`: the procedure, its decision, the reports.

- `cli`: the two commands' flags, the answer on the terminal and the output files;
- `procedure`: the orchestrator (`Diagnoser`: the steps' outcomes taken in, the result
  built once at the end with the run's verdict; `diagnose` and `compare`);
- `steps/`: one module per step (residency, single, concurrency, kv, context), each on its
  own typed inputs and measuring seams, returning a `steps.base.StepOutcome`;
  `step_inputs` hands them down from the `engine_run.EngineRun` (`PROCEDURE`, in order);
- `load` (a load step through the scheduler), `evidence` (its signals through the rules;
  diagnose's own readings as the exporter's samples where the exporter gave none);
- `monitor` (the exporter's series while an engine runs), `probe` (the engine's own
  endpoints), `facts` (what is known before any load), `launcher` (starting engines);
- `decision` (typed results, the answer), `report/` (HTML and Markdown).

The layers, lowest first, are in docs/architecture.md ("The diagnose path").
"""
