"""The base of every policy-file section's model."""

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    # A typo in an operator's file must be an error, not a silently ignored key. An infinite or
    # NaN number (YAML's .inf, .nan, or a float too large for a double) passes bounds like
    # `ge=1` and breaks only later, where the router turns it into a count: on the request path
    # or in a background loop, after check-policy and a reload have accepted it.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
