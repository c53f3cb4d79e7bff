"""Scoring translations (sacreBLEU and the paper-style tokenized BLEU)."""
