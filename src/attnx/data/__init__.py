"""Text to tensors: SentencePiece, binarized corpora, token-budget batching, the Batch seam."""
