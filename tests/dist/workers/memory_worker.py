"""msrun worker: measure_model_states of TinyNet's train network at each ZeRO stage.

Usage (under msrun): memory_worker.py --out DIR --stages 0,1,2,3
Builds, for each stage and layout, TinyNet + Adam + EMA with 2 accumulation steps (so accumulation
buffers exist) and writes DIR/stage{s}_{layout}_rank{r}.json: the measured bytes by kind. Layouts:
"padded" (pad_uneven_params=True, shard_ema=True: every parameter split, the EMA 1/N from stage 1)
and "mindone" (the defaults: only a dim 0 that divides is split, the EMA whole below stage 3).
Nothing is trained: the sizes are fixed at build time.
"""
import argparse
import json
import os
import sys


sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from models import LossNet, TinyNet, init_weights, make_optimizer  # noqa: E402

from mindone_zero import EMA, prepare_train_network  # noqa: E402
from mindone_zero.core.comm import init_data_parallel  # noqa: E402
from mindone_zero.memory.measure import measure_model_states  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--stages", default="0,1,2,3")
    args = parser.parse_args()
    rank, _ = init_data_parallel()
    for stage in (int(s) for s in args.stages.split(",")):
        for layout, padded in (("padded", True), ("mindone", False)):
            net = init_weights(TinyNet())
            ema = EMA(net, ema_decay=0.9)
            opt = make_optimizer(net.trainable_params(), "adam")
            train = prepare_train_network(LossNet(net), opt, ema=ema, gradient_accumulation_steps=2, zero_stage=stage,
                                          pad_uneven_params=padded, shard_ema=padded,
                                          params_split_info=os.path.join(args.out, f"info_s{stage}_{layout}"))
            result = {"memory": measure_model_states(train), "stage": int(train.zero_helper.zero_stage)}
            with open(os.path.join(args.out, f"stage{stage}_{layout}_rank{rank}.json"), "w") as f:
                json.dump(result, f)
            print(f"rank {rank}: stage {stage} {layout} measured", flush=True)


if __name__ == "__main__":
    main()
