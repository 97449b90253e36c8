"""Configuration: the seeds' YAML shapes, strict loading, secret references, human units.

from reach_plugins.config import load_config     # YAML path -> config with .agents, .tenants, .defaults
"""

from reach_plugins.config.loader import ReachConfig, TenantConfig, load_config, parse_config
from reach_plugins.config.quotas import QuotaConfig

__all__ = ["QuotaConfig", "ReachConfig", "TenantConfig", "load_config", "parse_config"]
