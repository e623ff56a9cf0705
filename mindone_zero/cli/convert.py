"""Combine per-rank ZeRO checkpoints into one checkpoint of full tensors.

    mindone-zero-convert \\
        --src_checkpoint "ckpt/rank_{}/net.ckpt" \\
        --src_param_split_info_json "params_info/params_split_info_{}.json" \\
        --group_size 4

``{}`` stands for the rank index 0 .. group_size-1. The output, ``src_checkpoint`` with ``{}``
replaced by ``all_{group_size}`` (MindOne's naming), is printed on stdout (with ``--max_shard_size``,
a folder of that name without extension, in the Hugging Face sharded safetensors layout;
``--dtype fp16|bf16|fp32`` writes floating tensors in that dtype; ``--strip_prefix net.`` and
``--copy_files_from HF_FOLDER`` make it a folder ``transformers`` loads); progress goes to
stderr, one line per tensor. Bad input exits with status 2 and a message naming the file and
the problem; no output file is written then. See ``mindone_zero.checkpoint.convert_checkpoints``.

The same command runs as ``python -m mindone_zero.cli.convert`` and, in a checkout, as
``python tools/convert_checkpoints.py``. Not collective: one process, no communication.
"""
import argparse
import sys

from ..checkpoint import convert_checkpoints


def _print_progress(done: int, total: int, name: str) -> None:
    print(f"[{done}/{total}] {name}", file=sys.stderr, flush=True)


def _size_arg(text):
    """An all-digit ``--max_shard_size`` as an int of bytes; anything else as given (checked by the combine)."""
    return int(text) if text is not None and text.strip().isdigit() else text


def main(argv=None) -> int:
    """Run the combine with command-line arguments ``argv`` (default: ``sys.argv[1:]``).

    Returns:
        0 after printing the output path on stdout.

    Raises:
        SystemExit: with status 2 and a message on stderr for bad arguments or a bad checkpoint
            (nothing is written then), with status 0 after ``--help``.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src_checkpoint", required=True, help='per-rank checkpoint path with "{}" for the rank')
    parser.add_argument("--src_param_split_info_json", required=True,
                        help='per-rank split-info JSON path with "{}" for the rank')
    parser.add_argument("--group_size", type=int, required=True, help="ranks in the optimizer parallel group")
    parser.add_argument("--output_format", choices=["ckpt", "safetensors"], default=None,
                        help="default: the input's format")
    parser.add_argument("--exclude_optimizer_states", action="store_true",
                        help="keep network parameters (and EMA) only")
    parser.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default=None,
                        help="floating tensors in this dtype (default: as stored)")
    parser.add_argument("--max_shard_size", default=None,
                        help='write a sharded safetensors folder, files of at most this size ("5GB", "500MB", bytes)')
    parser.add_argument("--strip_prefix", default=None,
                        help='taken off the front of every tensor name that has it, e.g. "net."')
    parser.add_argument("--add_prefix", default=None, help="then put in front of every tensor name")
    parser.add_argument("--copy_files_from", default=None,
                        help="with --max_shard_size: copy this folder's config and tokenizer files into the output")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    try:
        out = convert_checkpoints(
            args.src_checkpoint,
            args.src_param_split_info_json,
            args.group_size,
            output_format=args.output_format,
            exclude_optimizer_states=args.exclude_optimizer_states,
            progress=None if args.quiet else _print_progress,
            dtype=args.dtype,
            max_shard_size=_size_arg(args.max_shard_size),
            strip_prefix=args.strip_prefix,
            add_prefix=args.add_prefix,
            copy_files_from=args.copy_files_from,
        )
    except (ValueError, TypeError, OSError) as err:
        parser.error(str(err))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
