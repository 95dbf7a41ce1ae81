"""Agent state behind ``/v1/agents/{agent_id}/state``: who the caller's tenant is, then
``titan.context.agent_state``. No HTTP types here."""

from __future__ import annotations

from typing import Any

from titan.context.agent_state import AgentState, AgentStates
from titan.service.authentication import Authenticator
from titan.storage.base import DocumentStore

__all__ = ["AgentService", "AgentState"]


class AgentService:
    def __init__(self, auth: Authenticator, documents: DocumentStore):
        self.auth = auth
        self.states = AgentStates(documents)

    async def tenant_of(self, api_key: str | None) -> str:
        return await self.auth.tenant_for(api_key)

    async def get(self, api_key: str | None, agent_id: str) -> AgentState:
        return await self.states.get(await self.tenant_of(api_key), agent_id)

    async def put(
        self,
        api_key: str | None,
        agent_id: str,
        state: dict[str, Any],
        if_match: str | None,
        ttl_s: float | None,
    ) -> AgentState:
        tenant = await self.tenant_of(api_key)
        return await self.states.put(tenant, agent_id, state, if_match, ttl_s)

    async def patch(
        self,
        api_key: str | None,
        agent_id: str,
        patch: dict[str, Any],
        if_match: str | None,
        ttl_s: float | None,
    ) -> AgentState:
        tenant = await self.tenant_of(api_key)
        return await self.states.patch(tenant, agent_id, patch, if_match, ttl_s)

    async def delete(self, api_key: str | None, agent_id: str, if_match: str | None) -> None:
        await self.states.delete(await self.tenant_of(api_key), agent_id, if_match)
