"""aiocubie's errors and its warning: one hierarchy, rooted in :class:`AiocubieError`.

Every error says what was asked, what was available and what to do. Errors of cuda.core, CuPy,
numba, RMM and the driver are mapped to these once, where the backend meets them.
"""

from ._errors import (
    AiocubieError,
    AiocubieWarning,
    AllocationError,
    BackendError,
    BrokerError,
    BudgetError,
    ConfigurationError,
    ContextResetError,
    InsufficientMemoryError,
    InvalidRequestError,
    LeaseError,
    ManagerStateError,
    OutOfMemoryError,
    PlanningError,
    RegistrationError,
    ReleasedError,
    RunLengthMismatchError,
    SpilledError,
    UnchunkableTooLargeError,
    UnknownAllocatorError,
)

__all__ = [
    "AiocubieError",
    "AiocubieWarning",
    "AllocationError",
    "BackendError",
    "BrokerError",
    "BudgetError",
    "ConfigurationError",
    "ContextResetError",
    "InsufficientMemoryError",
    "InvalidRequestError",
    "LeaseError",
    "ManagerStateError",
    "OutOfMemoryError",
    "PlanningError",
    "RegistrationError",
    "ReleasedError",
    "RunLengthMismatchError",
    "SpilledError",
    "UnchunkableTooLargeError",
    "UnknownAllocatorError",
]
