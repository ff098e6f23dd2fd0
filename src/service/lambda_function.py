"""The Lambda entry point (template.yaml: ``Handler: service.lambda_function.handler``): the core, given
this application's handlers."""

from __future__ import annotations

from consumer import lambda_handler
from service.registry import HANDLERS

handler = lambda_handler(HANDLERS)
