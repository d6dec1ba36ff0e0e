# Fleet defaults for every host. Every variable is documented in README's configuration table;
# defaults not set here come from sparkfleet/config.py.
_sudo = True

# Secrets are references, never values: env:NAME (controller environment) or file:PATH (outside git).
vllm_api_key = "env:SPARKFLEET_VLLM_API_KEY"
