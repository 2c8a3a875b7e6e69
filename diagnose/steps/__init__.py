"""The steps of the procedure, one module each: typed inputs in, a `base.StepOutcome` out.

`diagnose.step_inputs.PROCEDURE` lists them in the order they run and hands each its inputs.
"""
