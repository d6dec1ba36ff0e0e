"""An example fleet: edit the hosts, keep the group names (deploy and rollout rely on `sparks` and `gateways`).

Fleet-wide values live in group_data/all.py and group_data/sparks.py; per-host overrides sit here.
"""

sparks = [
    ("spark-01.lan", {"ssh_user": "admin"}),
    ("spark-02.lan", {"ssh_user": "admin"}),
    # This Spark serves more concurrent agents with a shorter context.
    ("spark-03.lan", {"ssh_user": "admin", "vllm_args": {"max-num-seqs": 8, "max-model-len": 131072}}),
]

# The fleet's one OpenAI address: HAProxy in front of every Spark above, drained by rollouts (README, "The gateway").
gateways = [("gateway.lan", {"ssh_user": "admin"})]
