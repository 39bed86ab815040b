"""Training: the loop, loss, validation, learning-rate schedule, CUDA graphs and the run outputs."""
