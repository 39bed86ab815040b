"""Training runs scored against anemoi-training's Held-Suarez scores and the built-in baselines."""
