"""DeepSpeed-MII's OpenAI server options (spec.engine.extraArgs for engine deepspeed).

The option strings of `python -m mii.entrypoints.openai_api_server` in deepspeed-mii 0.3.3
(mii/entrypoints/openai_api_server.py, the `add_argument` calls of its `__main__` block), one tuple
per argparse action. tests/conformance/test_deepspeed.py reads the same parser inside the
deepspeed-mii-0.3.3 venv and fails when this table differs from it. Both `--max-length` (default
32768) and `--max_length` (default None) are real options with the same destination.
"""

VERSION = "0.3.3"
SOURCE = "deepspeed-mii 0.3.3 wheel (deepspeed_mii-0.3.3-py3-none-any.whl): mii/entrypoints/openai_api_server.py"

DEEPSPEED_OPTIONS: tuple[tuple[str, ...], ...] = (
    ('--model',),
    ('--deployment-name',),
    ('--load-balancer',),
    ('--max-length',),
    ('--host',),
    ('--port',),
    ('--allow-credentials',),
    ('--allowed-origins',),
    ('--allowed-methods',),
    ('--allowed-headers',),
    ('--max_length',),
    ('--tensor-parallel',),
    ('--replica-num',),
    ('--chat-template',),
    ('--response-role',),
    ('--api-keys',),
    ('--ssl',),
    ('-h', '--help'),
)
