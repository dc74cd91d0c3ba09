"""The process-wide cache of the SDK's data files (tests/moto_account.py, ``share_sdk_data``)."""

from __future__ import annotations

from pathlib import Path

import boto3
import botocore.session
from moto_account import share_sdk_data


def test_new_sessions_share_the_parsed_service_models_and_nothing_else() -> None:
    # Given the shared cache (conftest installs it; again here, as it is idempotent)
    share_sdk_data()
    # When two sessions load the same model
    first, second = boto3.Session(region_name="us-east-1"), boto3.Session(region_name="us-east-1")
    model = first._loader.load_service_model("sqs", "service-2")
    # Then the second reads the first's parse, not the file
    assert second._loader.load_service_model("sqs", "service-2") is model
    # And each session keeps its own event handlers
    assert second._session.get_component("event_emitter") is not first._session.get_component("event_emitter")


def test_a_loader_with_another_search_path_has_its_own_cache(tmp_path: Path) -> None:
    # Given a data path with a model of its own (as AWS_DATA_PATH would add)
    share_sdk_data()
    (tmp_path / "sqs" / "2012-11-05").mkdir(parents=True)
    (tmp_path / "sqs" / "2012-11-05" / "service-2.json").write_text('{"metadata": {"probe": true}}')
    session = botocore.session.Session()
    session.set_config_variable("data_path", str(tmp_path))
    # When it loads the model, Then it reads its own file, not the default path's cached parse
    assert session.get_component("data_loader").load_service_model("sqs", "service-2") == {
        "metadata": {"probe": True}
    }
    assert "probe" not in boto3.Session()._loader.load_service_model("sqs", "service-2")["metadata"]
