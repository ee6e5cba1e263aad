"""What a trial can observe: failure kinds and the engines' error texts, benchmark results, load signals."""
