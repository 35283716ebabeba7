"""Handing a thread worker's result back to the UI: the worker may outlive what it reports to.

A worker (`@work(thread=True)`) reads files or runs checks off the UI thread and hands its result back with
`App.call_from_thread`. By then the user may have quit (the app refuses the call) or left the screen (its
widgets are gone). Either way the result has nowhere to go and is dropped: seen in CI, where the presets
screen's pre-launch checks finished while a test's app shut down and failed it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from textual.app import App
from textual.css.query import NoMatches
from textual.dom import DOMNode

Method = TypeVar("Method", bound=Callable[..., Any])


def call_from_worker(node: DOMNode, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """`call_from_thread(callback, ...)` on the app of `node` (the app itself, or a screen or widget of it), from
    a worker thread; nothing once the app has stopped."""
    try:
        app = node if isinstance(node, App) else node.app
        app.call_from_thread(callback, *args, **kwargs)
    except RuntimeError:  # no app any more ("App is not running", or no active app for a dismantled screen)
        pass


def while_mounted(method: Method) -> Method:
    """For a screen's UI-thread method that a worker calls back: a no-op once the widgets it queries are gone."""

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except NoMatches:
            return None

    return guarded  # type: ignore[return-value]
