"""Configuration: the seeds' YAML shapes, strict loading, secret references, human units.

    from reach_plugins.config import load_config     # YAML path -> config with .agents, .tenants, .defaults
"""

from reach_plugins.config.loader import ReachConfig, TenantConfig, load_config, parse_config

__all__ = ["ReachConfig", "TenantConfig", "load_config", "parse_config"]
