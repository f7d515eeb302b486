"""The parts of bench/bench_attention.py (the command): impls (each implementation's setup on one
workload), timing (rounds, CUDA graphs, the cosine check, one workload's schedule), isolate (each
workload in a child process, so that one implementation's crash does not end the run) and report
(the ratios, the markdown table, the JSON and markdown files). bench/ is on sys.path: these import
bench/workloads.py and bench/gpu_monitor.py as top-level modules."""
