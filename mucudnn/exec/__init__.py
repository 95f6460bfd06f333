"""Runs a Plan on a Backend: micro-batch views, alpha/beta, workspace, graph replay, MicroBatchHandle."""
