"""Whether a caller may make this request: the key's model list and the budgets of the key and
its tenant, against the usage ledger."""

from __future__ import annotations

from titan.config import TitanConfig
from titan.config.admission import Budget
from titan.errors import PermissionDeniedError, QuotaExceededError, StorageUnavailableError
from titan.limits.usage import UsageLedger
from titan.limits.usage_buffer import UsageBuffer
from titan.service.authentication import Caller
from titan.service.storage_health import StorageHealth, fail_open_or_raise


class PolicyCheck:
    def __init__(
        self,
        config: TitanConfig,
        usage: UsageLedger,
        pending_usage: UsageBuffer,
        storage_health: StorageHealth,
    ):
        self.config = config
        self.usage = usage
        self.pending_usage = pending_usage
        self.storage_health = storage_health
        self.is_fail_open = config.admission.on_storage_error == "fail_open"

    async def check(self, caller: Caller, model: str) -> None:
        key = caller.key
        if key is None:
            return
        if key.policy.models and model not in key.policy.models:
            raise PermissionDeniedError(
                f"This API key may not use the model '{model}'; it may use "
                f"{', '.join(key.policy.models)}.",
                code="model_not_allowed",
            )
        budgets: list[tuple[str, str, Budget]] = []
        if key.policy.budget is not None:
            budgets.append((f"key:{key.key_id}", f"key {key.key_id}", key.policy.budget))
        tenant = self.config.tenants.get(key.tenant)
        if tenant is not None and tenant.budget is not None:
            budgets.append((f"tenant:{key.tenant}", f"tenant '{key.tenant}'", tenant.budget))
        if not budgets:
            return
        try:
            if self.pending_usage.has_pending:
                await self.pending_usage.flush()  # this replica's spend, to the last request
            spent_by_scope = [await self.usage.spent_usd(s, b.period) for s, _, b in budgets]
        except StorageUnavailableError as exc:
            fail_open_or_raise(self.storage_health, "budget", exc, is_fail_open=self.is_fail_open)
            return
        self.storage_health.succeeded("budget")
        for (_, label, budget), spent in zip(budgets, spent_by_scope, strict=True):
            if spent >= budget.usd:
                period = "in all" if budget.period == "total" else f"this {budget.period}"
                raise QuotaExceededError(
                    f"The budget of the {label} is spent: ${spent:.4f} of ${budget.usd:.2f} "
                    f"{period}. Raise the budget or wait for the next period.",
                )
