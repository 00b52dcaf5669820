"""Reading numbers back out of a model: the distribution over whole numbers, the decoding
readouts (expected, median, mode) and the numeric metrics."""
