# Values for the `sparks` group (applied after all.py).
vllm_recipe = "qwen3.6-35b-a3b-nvfp4"
model_dir = "/var/lib/sparkfleet/models"
# A mirror inside your network that publishes SHA256SUMS beside the files (see README, "Model sources").
model_source = "http://mirror.lan/models/nvidia--Qwen3.6-35B-A3B-NVFP4"
