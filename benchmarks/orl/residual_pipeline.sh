#!/usr/bin/env bash
# Issue 39 on one GPU, in stages that each fit one 10-minute device call: a sum_set_small Base, the
# offline residual warm-up at three adapter rates (with the ratio and the adapter-off ablation),
# ORL from a warmed model with the paper's QwenDLM recipe (lambda_AEC 1 beside 0), and the sweep.
#
#   bash benchmarks/orl/residual_pipeline.sh STAGE WORK OUT   (from the repository root)
#     base    one Base per seed in $BASE_SEEDS (default 0), in parallel (`dlmrt train sft`, 5,000
#             steps, ~4 GPU-minutes, block $BLOCK, default 32) -> OUT/base (seed 0), OUT/base-sN
#             (seed N, its spread) (bf16)
#     warmup  OUT/base -> WORK/warm-TAG for each LR or LR:EPS:STEPS[:S] in $WARM_LRS (in parallel;
#             TAG the spec with - for :; S a new adapter's post-norm scale, `--post-norm-scale`),
#             each -> OUT/warm-TAG (bf16) with its log and config and
#             `dlmrt train eval` adapter on / off -> OUT/warm-TAG-{on,off}.json;
#             then benchmarks/orl/warmup_summary.py: OUT/warmups.json (the gate) and OUT/warm.txt
#             (the warm-up ORL starts from)
#     orl     $WARM (default: OUT/warm.txt's) -> recipes/sumset-residual-orl{,-no-aec}.toml in
#             parallel, stopped after $ORL_WALL seconds (the trainer saves and exits) -> OUT/orl-aec{1,0}
#     sweep   benchmarks/orl/orl_demo.py over OUT/base, OUT/base-s*, $WARM and OUT/orl-aec{1,0} on
#             the issue's grids -> OUT/sweep.json; the ORL models with the adapter off -> OUT/*-off.json
# OUT's exports are bf16 (~10 MB each): what comes back from a device call and is carried into
# the next. SMOKE=1 runs every stage in seconds on the CPU (tiny steps, few problems): a check of
# the commands, not a measurement. docs/orl-demo.md says what the stages measured.
set -euo pipefail
stage=$1 work=$2 out=$3
mkdir -p "$work" "$out"
if [ "${SMOKE:-0}" = 1 ]; then
  dev=cpu base_steps=20 warm_steps=4 orl_wall=${ORL_WALL:-60} problems=4 steps_flag="--steps 2"
else
  dev=cuda base_steps=5000 warm_steps=400 orl_wall=${ORL_WALL:-480} problems=500 steps_flag=""
fi
WARM_LRS=${WARM_LRS:-"1e-4 3e-4 1e-3"}
BASE_SEEDS=${BASE_SEEDS:-0}
BLOCK=${BLOCK:-32}
[ -z "${WARM:-}" ] && [ -f "$out/warm.txt" ] && WARM=$(cat "$out/warm.txt")
evaluate() {  # MODEL ADAPTER FILE: accuracy and TPF at entropy_budget 0.4 on the held-out problems
  dlmrt train eval --model "$1" --task sum_set_small --problems "$problems" --max-new-tokens 64 \
    --rule entropy_budget --entropy-budget 0.4 --device "$dev" --adapter "$2" --out "$3" >/dev/null
}
case $stage in
  base)
    for seed in $BASE_SEEDS; do
      name=base; [ "$seed" = 0 ] || name=base-s$seed
      (dlmrt train sft --out "$work/$name" --task sum_set_small --block-size "$BLOCK" --seed "$seed" \
         --steps "$base_steps" --eval-every 0 --device "$dev" --no-progress >/dev/null &&
       dlmrt train export "$work/$name" "$out/$name" --dtype bfloat16) &
    done
    wait ;;
  warmup)
    for spec in $WARM_LRS; do  # LR, or LR:EPS:STEPS[:S] (adapter AdamW eps, steps, post-norm)
      IFS=: read -r lr eps steps post <<<"$spec"
      tag=${spec//:/-} eps=${eps:-1e-15} steps=${steps:-$warm_steps}
      post_flag=(); [ -n "${post:-}" ] && post_flag=(--post-norm-scale "$post")
      (dlmrt train residual --out "$work/warm-$tag" --model "$out/base" --task sum_set_small \
         --steps "$steps" --adapter-lr "$lr" --adapter-adam-eps "$eps" --log-every 20 \
         "${post_flag[@]}" --device "$dev" >/dev/null &&
       dlmrt train export "$work/warm-$tag" "$out/warm-$tag" --dtype bfloat16 >/dev/null &&
       cp "$work/warm-$tag/log.jsonl" "$out/warm-$tag.log.jsonl" &&
       cp "$work/warm-$tag/warmup_config.json" "$out/warm-$tag.config.json" &&
       evaluate "$out/warm-$tag" on "$out/warm-$tag-on.json" &&
       evaluate "$out/warm-$tag" off "$out/warm-$tag-off.json") &
    done
    wait
    python -m benchmarks.orl.warmup_summary "$out" | tail -1 >"$out/warm.txt" ;;
  orl)
    for arm in aec1:sumset-residual-orl aec0:sumset-residual-orl-no-aec; do
      name=${arm%%:*} recipe=${arm#*:}
      (timeout -s TERM "$orl_wall" dlmrt train orl --recipe "recipes/$recipe.toml" \
         --model "$WARM" --out "$work/orl-$name" --device "$dev" --no-progress $steps_flag \
         >"$out/orl-$name.train.log" 2>&1 || true
       dlmrt train export "$work/orl-$name" "$out/orl-$name" --dtype bfloat16 >/dev/null &&
       cp "$work/orl-$name/log.jsonl" "$out/orl-$name.log.jsonl") &
    done
    wait ;;
  sweep)
    taus="0.95 0.9 0.85 0.8 0.75 0.7 0.6 0.5" gammas="0.1 0.2 0.3 0.4 0.6 0.8 1.5 3.0"
    [ "${SMOKE:-0}" = 1 ] && taus="0.9" gammas="0.4"
    seeds=(); for d in "$out"/base-s*/; do [ -d "$d" ] && seeds+=(--model "$(basename "$d")=$d"); done
    python -m benchmarks.orl.orl_demo --model base="$out/base" "${seeds[@]}" --model warm="$WARM" \
      --model orl_aec1="$out/orl-aec1" --model orl_aec0="$out/orl-aec0" \
      --task sum_set_small --problems "$problems" --max-new-tokens 64 --device "$dev" \
      --gammas $gammas --taus $taus --out "$out/sweep.json"
    for name in aec1 aec0; do evaluate "$out/orl-$name" off "$out/orl-$name-off.json"; done ;;
  *) echo "stage: base | warmup | orl | sweep" >&2; exit 2 ;;
esac
