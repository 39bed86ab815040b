"""Process-level runtime around the network: heap release, process memory, inference environment overrides,
backend checks, torch.compile, the memory plan (num_chunks: auto) and the precision plan."""
