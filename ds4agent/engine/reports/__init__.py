"""What the engine reports about itself: the kernels' self-check case by case (check.py, for
`ds4 inspect --kernels`) and `ds4 bench`'s measurements (bench.py)."""
