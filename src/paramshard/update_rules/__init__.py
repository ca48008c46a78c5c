"""The update rules (SGD, momentum, Adagrad, Adam, FTRL, row-wise Adagrad) as numpy maths, owned by no side.

The parameter servers apply them to dense blocks and sparse rows; collective
mode applies the same code to each trainer's replica after allreduce. Keeping
them here (not under ``server/``) lets both import them without collective mode
depending on the server package. The rules' configuration lives in ``paramshard.optim``.
"""
from paramshard.update_rules.rules import CHUNK, RULES, Rule, make_rule

__all__ = ["CHUNK", "RULES", "Rule", "make_rule"]
