"""dlmrt.train: block-diffusion SFT of QwenDLM-format models on procedural, verifiable tasks.

`dlmrt train sft --task arithmetic --out DIR` (or `trainer.train_sft(TrainConfig(...), DIR)`)
trains with the inference engine's own model classes; the run directory is an HF checkpoint
that `dlmrt.LLM` loads as-is. Modules: `tasks/` (problems and verifiers), `tokenizer` (BPE on
the task text), `data` (formatting and packing), `masks` (the training attention mask),
`noise`, `sft_loss`, `model` (construction and weights I/O), `trainer`, `evaluate`, `export`.
"""
