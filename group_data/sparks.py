# Values for the `sparks` group (applied after all.py).
vllm_recipe = "qwen3.6-35b-a3b-nvfp4"
model_dir = "/var/lib/sparkfleet/models"
# Weights come from the recipe's model on the Hugging Face Hub unless model_source says otherwise: a mirror
# inside your network that publishes SHA256SUMS beside the files, e.g.
# model_source = "http://mirror.lan/models/nvidia--Qwen3.6-35B-A3B-NVFP4" (see README, "Model sources").
