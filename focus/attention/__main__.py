"""`python -m focus.attention`: the table of which attention path runs when (docs/attention_plan.md is its output)."""

from focus.attention.dispatch.planning import plan_table

print(plan_table(), end="")
