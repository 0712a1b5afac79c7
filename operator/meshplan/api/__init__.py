"""The LLMDeployment API: pydantic models (the single source) and the CRD generated from them."""

from meshplan.api.models import (  # noqa: F401
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    LLMDeployment,
    LLMDeploymentSpec,
    LLMDeploymentStatus,
    validate_semantics,
)
