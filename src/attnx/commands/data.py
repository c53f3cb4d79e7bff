"""`attnx download` and `attnx prepare`: raw parallel text in, a binarized corpus out (no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from attnx.data.prepare import Settings

Corpus = Literal["multi30k", "wmt14_ende", "wmt14_ende_test"]


def download(
    corpora: list[Corpus],
    output: Path = Path("data/raw"),
    from_dir: Path | None = None,
    link: bool = False,
) -> int:
    """Fetch raw English-German parallel text into OUTPUT/{corpus}/{split}.{lang}.gz.

    multi30k: train, val, test_2016_flickr; wmt14_ende: europarl_v7, commoncrawl, news_commentary_v9 (4.5M
    pairs); wmt14_ende_test: newstest2013, newstest2014 (full). Example: attnx download multi30k --output
    raw; offline, --from_dir copies them from a folder holding a copy (e.g. one an earlier download wrote).

    Args:
        corpora: One or more of multi30k, wmt14_ende, wmt14_ende_test.
        output: Directory receiving one folder per corpus.
        from_dir: Copy the files from FROM_DIR/{corpus}/{split}.{lang}[.gz] instead of downloading.
        link: With --from_dir, symlink instead of copying.
    """
    from attnx.data.download import copy_from
    from attnx.data.download import download as fetch_corpus

    for corpus in corpora:
        written = copy_from(corpus, from_dir, output, link=link) if from_dir else fetch_corpus(corpus, output)
        print(f"{corpus}: {len(written)} files in {output / corpus}")
    return 0


download.positional_list = "corpora"  # named without an option: `attnx download multi30k wmt14_ende_test`


def prepare(
    src_lang: str,
    tgt_lang: str,
    train: str | list[str],
    output: Path,
    valid: str | None = None,
    test: str | list[str] | None = None,
    vocab_size: int | None = None,
    max_sentence_tokens: int = Settings.max_sentence_tokens,
    max_ratio: float = Settings.max_ratio,
    sample_size: int = Settings.sample_size,
    character_coverage: float = Settings.character_coverage,
    seed: int = Settings.seed,
    drop_duplicates: bool = Settings.drop_duplicates,
    drop_copies: bool = Settings.drop_copies,
    drop_wrong_language: bool = Settings.drop_wrong_language,
    train_repeat: list[int] | None = None,
    train_tag: list[str] | None = None,
    user_defined_symbols: list[str] | None = None,
    report: Path | None = None,
    workers: int | None = None,
    spm_model: Path | None = None,
    train_align: str | list[str] | None = None,
    valid_align: Path | None = None,
) -> int:
    """Train one joint SentencePiece BPE model on both languages and write a memory-mapped binarized corpus.

    A split PREFIX means the files PREFIX.SRC_LANG and PREFIX.TGT_LANG, each plain or .gz, one segment a line.
    Training pairs are cleaned (blank, copied, duplicate, wrong-language, too long, unbalanced: each counted per
    corpus); validation and test sets are kept whole. A re-run with the same inputs (by content) and settings
    reuses the output directory, which must be new, empty or an earlier prepare's: prepare never deletes or
    overwrites a file it did not write.
    Example: attnx prepare --src_lang en --tgt_lang de --train raw/multi30k/train --valid raw/multi30k/val
    --test raw/multi30k/test_2016_flickr --vocab_size 8000 --output data/multi30k

    Args:
        src_lang: Source language code: the file suffix, e.g. en.
        tgt_lang: Target language code: the file suffix, e.g. de.
        train: Training corpus prefix, or NAME=PREFIX; a list (or the option repeated) concatenates several
            corpora, each recorded under its name in meta.json: --train europarl=raw/europarl --train
            bt=raw/backtranslated. Named corpora can be mixed by weight in fit (data.corpus_weights,
            data.sampling_temperature); an unnamed corpus is named by its prefix.
        output: Output directory: new, empty, or written by an earlier prepare (reused when inputs and settings match).
        valid: Validation set prefix (split name: valid), or NAME=PREFIX.
        test: Test set prefixes, split name 'test' unless written NAME=PREFIX: --test newstest2014=PATH.
        vocab_size: Pieces in the joint BPE vocabulary (§5.1: about 37,000 for WMT14 en-de); default
            8000, or with --spm_model the model's own.
        max_sentence_tokens: Drop training pairs with more tokens than this on either side.
        max_ratio: Drop training pairs whose longer side has more than this many times the shorter's tokens.
        sample_size: SentencePiece trains on a random sample of this many sentences.
        character_coverage: Share of characters the vocabulary must cover; rarer ones become <unk>.
        seed: Seed of SentencePiece's sampling.
        drop_duplicates: Drop a training pair identical to an earlier one (in any training corpus).
        drop_copies: Drop training pairs whose target is the source, unchanged.
        drop_wrong_language: Drop training pairs with a side that language identification (py3langid) finds in
            another language than SRC_LANG / TGT_LANG; off by itself for a language it does not know.
        train_repeat: Times each --train corpus goes into the training split after cleaning (upsampling), one
            count per corpus in --train order: --train '[real, synthetic]' --train_repeat '[2, 1]'. Default: once.
        train_tag: A token put before every source sentence of each --train corpus ("" for none) and kept as one
            SentencePiece piece, e.g. back-translations marked as such: --train_tag '["", "<BT>"]'.
        user_defined_symbols: More tokens SentencePiece keeps as one piece wherever they occur.
        report: Also write a Markdown report of the pairs dropped per training corpus and reason, with examples.
        workers: Threads for SentencePiece training and encoding, processes for language identification
            (default: every core).
        spm_model: Use this SentencePiece model (the .model file of spm_train, or of another corpus) instead
            of training one, to share a vocabulary with other runs: it is copied into the corpus unchanged and
            meta.json records its path and SHA-256. It must have attnx's special ids (pad 0, unk 1, bos 2,
            eos 3); --vocab_size is read from it, and the options that shape training (--sample_size,
            --character_coverage, --seed) do not apply.
        train_align: Word alignments of each --train corpus for guided alignment (loss guided_alignment), in
            Pharaoh format: one line per line of the corpus, 0-based `source-target` pairs of its
            whitespace-separated words (eflomal, fast_align), mapped onto the pieces; one file per --train corpus,
            in order. Pairs that cleaning drops drop their line. See "Guided alignment" in docs/training.md.
        valid_align: The same for --valid: what val/alignment_loss is measured on.
    """
    from attnx.commands.prepare import prepare_command

    return prepare_command(
        Settings(
            src_lang=src_lang,
            tgt_lang=tgt_lang,
            vocab_size=Settings.vocab_size if vocab_size is None else vocab_size,
            max_sentence_tokens=max_sentence_tokens,
            max_ratio=max_ratio,
            sample_size=sample_size,
            character_coverage=character_coverage,
            seed=seed,
            drop_duplicates=drop_duplicates,
            drop_copies=drop_copies,
            drop_wrong_language=drop_wrong_language,
            train_repeat=tuple(train_repeat or ()),
            train_tag=tuple(train_tag or ()),
            user_defined_symbols=tuple(user_defined_symbols or ()),
        ),
        train=train,
        output=output,
        valid=valid,
        test=test or [],
        workers=workers,
        report_file=report,
        spm_model=spm_model,
        vocab_size_given=vocab_size is not None,
        train_align=[train_align] if isinstance(train_align, str) else list(train_align or []),
        valid_align=valid_align,
    )
