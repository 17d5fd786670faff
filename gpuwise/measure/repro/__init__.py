"""`gpuwise repro`: run a user's training command many times, one source of variation at a time.

plan: which runs, and the environment of each; collect: the metrics a run reported;
store: the results file (JSON lines), which makes a study resumable; energy: RAPL/NVML
counters; runner: runs the plan in parallel and hands the records to the analysis.
"""
