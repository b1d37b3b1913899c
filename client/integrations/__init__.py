"""execgate under an agent framework: the framework's agent proposes, execgate executes.

    openai_agents   the daemon's tools as the OpenAI Agents SDK's function tools
                    (`pip install 'execgate[openai-agents]'`)
    langgraph       a LangGraph node that runs a turn's tool calls as one execgate batch
                    (`pip install 'execgate[langgraph]'`)

Import the module of your framework by name; this package imports neither framework, so
`import execgate.client` never loads one. Both adapters rest on `_gate`: the tool list
from `ListTools`, the framework's tool-call id as call id and idempotency key, a turn's
calls on the Execute stream (approval waits reported as they happen), a cancelled turn
passed on to the daemon's `Cancel`, and each outcome rendered as the text the model reads,
with its status and error class.
"""

__all__: list[str] = []
