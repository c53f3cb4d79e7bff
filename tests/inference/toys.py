"""Toy models, batches and settings the search tests decode with: a tiny Transformer, a Markov model whose
distributions are written by hand, and edits of a model's logits that make hypotheses end (or not) at chosen
lengths."""

from __future__ import annotations

import torch

from attnx.data.batch import EOS_ID, collate
from attnx.inference.config import SearchConfig
from attnx.model import build_transformer
from attnx.model.transformer import DecoderState
from tests.conftest import tiny_config


def make_model(**overrides):
    return build_transformer(tiny_config(**overrides)).eval()


def sources(*lengths: int, vocab: int = 50):
    """A padded batch of random sources of the given lengths (ids >= 4), EOS appended."""
    gen = torch.Generator().manual_seed(sum(lengths))
    ids = [torch.randint(4, vocab, (n,), generator=gen).tolist() for n in lengths]
    batch = collate([(x, []) for x in ids])
    return batch.src, batch.src_mask


class StepRecorder:
    """Wraps ``model.decode_step``: records the rows of every call, optionally edits the logits."""

    def __init__(self, model, edit=None):
        self.rows: list[int] = []
        self.inner = model.decode_step
        self.edit = edit
        model.decode_step = self

    def __call__(self, tokens, state):
        self.rows.append(tokens.shape[0])
        logits = self.inner(tokens, state)
        return logits if self.edit is None else self.edit(logits, state.offset - 1)


def likelier_eos(logits, position):
    """</s> more likely at every position, so hypotheses and sentences end at different lengths."""
    logits = logits.clone()
    logits[:, EOS_ID] += 0.4 * position
    return logits


def never_eos(logits, position):
    logits = logits.clone()
    logits[:, EOS_ID] = -1e4  # finite: EOS is still possible when forced
    return logits


class MarkovModel(torch.nn.Module):
    """A toy decoder: next-token log-probs depend only on the position and the last token."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", table.log())  # (positions, V, V) probabilities
        self.vocab_size = table.shape[-1]

    def encode(self, src, src_mask):
        return src.float().unsqueeze(-1)

    def start_decoding(self, memory, src_mask):
        return DecoderState(memory=memory, src_mask=src_mask)

    def decode_step(self, tokens, state):
        state.offset += 1
        return self.table[state.offset - 1, tokens]

    def decode(self, tgt_in, memory, src_mask):
        return torch.stack([self.table[i, tgt_in[:, i]] for i in range(tgt_in.shape[1])], 1)


def sampling(**changes):
    return SearchConfig(sampling=True, max_len_a=0.5, max_len_b=6, **changes)
