"""Training in NumPy: data windows, AdamW with a warm-up + cosine schedule, the loop."""
