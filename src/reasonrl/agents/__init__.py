"""Multi-turn tool use: environments, tools, tool-call parsing, the episode rollout engine, episode
rewards and turn-level credit assignment (docs/agents.md); agents written against the OpenAI API:
the endpoint recording what they sample (`endpoint`), their calls as training sequences
(`trajectories`) and the engine that runs them (`openai_agents`; docs/environments.md)."""

from reasonrl.agents.builtin import ENVIRONMENTS, exact_match, python_math, retrieval_qa
from reasonrl.agents.credit import turn_grpo, turn_level_advantages, turn_returns, turn_spans
from reasonrl.agents.engine import OBSERVATION_TEMPLATES, AgentEngine, Episode, EpisodeCompletion, Turn
from reasonrl.agents.environment import Environment, StepResult, ToolEnvironment
from reasonrl.agents.parsing import PARSERS, TURN_STOPS, Malformed, ToolCall
from reasonrl.agents.rewards import EPISODE_STATISTICS, EpisodeReward, EpisodeStatistic, TurnRewards
from reasonrl.agents.tools import (
    CalculatorTool,
    Document,
    FunctionTool,
    PythonTool,
    RetrievalTool,
    Tool,
    ToolError,
    ToolResult,
    evaluate_expression,
    load_corpus,
    tool_schemas,
)

__all__ = ["ENVIRONMENTS", "EPISODE_STATISTICS", "OBSERVATION_TEMPLATES", "PARSERS", "TURN_STOPS", "AgentEngine",
           "CalculatorTool", "Document", "Environment", "Episode", "EpisodeCompletion", "EpisodeReward",
           "EpisodeStatistic", "FunctionTool", "Malformed", "PythonTool", "RetrievalTool", "StepResult", "Tool",
           "ToolCall", "ToolEnvironment", "ToolError", "ToolResult", "Turn", "TurnRewards", "evaluate_expression",
           "exact_match", "load_corpus", "python_math", "retrieval_qa", "tool_schemas", "turn_grpo",
           "turn_level_advantages", "turn_returns", "turn_spans"]
