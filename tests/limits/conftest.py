from tests.redis_server import redis_prefix, redis_server, redis_url

__all__ = ["redis_prefix", "redis_server", "redis_url"]
