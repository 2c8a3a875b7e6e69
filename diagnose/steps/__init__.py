"""The steps of the procedure, one module each behind `base.ProcedureStep`.

`diagnose.procedure.PROCEDURE` lists them in the order they run.
"""
