"""The base of every policy-file section's model."""

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    # A typo in an operator's file must be an error, not a silently ignored key.
    model_config = ConfigDict(extra="forbid", frozen=True)
