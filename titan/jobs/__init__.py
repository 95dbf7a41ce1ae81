"""Async jobs and batches: the job model, the worker, and the Batch API on the job queue."""
