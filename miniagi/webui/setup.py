"""What the start form says of the model before anything is typed: whether an endpoint is configured at all (and,
if not, how to fix it: `miniagi setup`), the model a run would use, and the models the endpoint lists (GET /models,
asked once, in the background, so no page waits for it).

It reads the settings as a run started in the work directory would: the UI's environment over that folder's .env
over the user's own ~/.miniagi/.env (`miniagi setup`) over the defaults. The key itself is never put on a page.
"""

from __future__ import annotations

import threading
from typing import Mapping

from ..config import OPTIONS_BY_NAME, ConfigError, Endpoint, _from_layer, read_dotenv, read_user_dotenv
from .workbench import Workbench

MODELS_SHOWN = 200  # of the names an endpoint lists, offered in the form


class EndpointView:
    def __init__(self, bench: Workbench):
        self.bench = bench  # its environment, and its first work directory's .env, as a run there reads them
        self._models: list[str] | None = None
        self._asking: threading.Thread | None = None
        self._lock = threading.Lock()

    def _layers(self) -> tuple[Mapping[str, str], dict[str, str]]:
        return self.bench.environ, {**read_user_dotenv(), **read_dotenv(self.bench.workdirs[0])}

    def endpoint(self) -> Endpoint:
        environ, dotenv = self._layers()
        return Endpoint.from_environment(environ, dotenv)

    def problem(self) -> str:
        """Why a run started here could not reach a model, or "" when an endpoint is configured."""
        try:
            self.endpoint().check()
        except ConfigError as exc:
            return str(exc)
        return ""

    def model(self) -> str:
        """The model a run started here uses when the form names none."""
        option = OPTIONS_BY_NAME["model"]
        for layer in self._layers():
            found = _from_layer(option, layer)
            if found:
                return found
        return option.default

    def models(self) -> list[str]:
        """The models the endpoint lists; [] until it has answered (asked once, in the background), or when it does
        not list them."""
        with self._lock:
            if self._models is None and self._asking is None and not self.problem() and self._endpoint_trusted():
                self._asking = threading.Thread(target=self._ask, name="list-models", daemon=True)
                self._asking.start()
            return list(self._models or [])

    def _endpoint_trusted(self) -> bool:
        """Whether the endpoint the work directory's .env names (and its key) is one the user said yes to: that .env
        lies where code runs, and the key goes with the question. Else nothing is asked: the run started there asks
        the user first (trust.py)."""
        from ..trust import ENDPOINT_NAMES, TrustRecord, _digest

        path = self.bench.workdirs[0] / ".env"
        dotenv = read_dotenv(self.bench.workdirs[0])
        facts = {name: _digest(dotenv[name]) for name in ENDPOINT_NAMES
                 if str(dotenv.get(name) or "").strip() and not self.bench.environ.get(name)}
        return not facts or not TrustRecord().judge(path, facts)

    def _ask(self) -> None:
        from ..endpoint import OpenAIModel
        from ..prices import PriceTable

        try:
            names = OpenAIModel(self.endpoint(), PriceTable(None)).served_models()[:MODELS_SHOWN]
        except Exception:  # an endpoint that cannot be asked: the form offers no list
            names = []
        with self._lock:
            self._models = names
