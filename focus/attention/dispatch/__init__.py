"""The choice: a call's facts (`facts`, `fast_path`), the kernels as rows of one ordered table (`kernel_table`, run by
`kernel_runs`, a decoding step's cost by `step_cost`) and the plan that scans them (`planning`)."""
