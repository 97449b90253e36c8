"""The tool provider: saving the credentials checks that the registry lists agents."""

from typing import Any

from dify_plugin import ToolProvider
from dify_plugin.errors.tool import ToolProviderCredentialValidationError

from reach_plugins.dify import check_settings
from reach_plugins.errors import ReachError


class ReachProvider(ToolProvider):
    def _validate_credentials(self, credentials: dict[str, Any]) -> None:
        try:
            check_settings(credentials)
        except ReachError as exc:
            raise ToolProviderCredentialValidationError(exc.message) from exc
