"""The language server: pygls wiring of the LSP methods to the workspace model
(documents.py) and the answers (hover.py, complete.py, navigate.py, highlight.py)."""
from __future__ import annotations

import asyncio

from lsprotocol import types as T
from pygls.lsp.server import LanguageServer

from .. import __version__
from . import complete, highlight, navigate
from .documents import Documents


class TasmServer(LanguageServer):
    def __init__(self, debounce: float = 0.15):
        super().__init__("tpuasm", __version__,
                         text_document_sync_kind=T.TextDocumentSyncKind.Incremental)
        self.documents = Documents(self)
        self.debounce = debounce
        self._pending: dict[str, asyncio.TimerHandle] = {}

    def schedule(self, uri: str) -> None:
        """Re-check `uri` (and the open files that include it) after a quiet spell: typing
        fast re-checks once, not per keystroke."""
        old = self._pending.pop(uri, None)
        if old is not None:
            old.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.publish(uri)
            return
        self._pending[uri] = loop.call_later(self.debounce, self.publish, uri)

    def publish(self, uri: str) -> None:
        self._pending.pop(uri, None)
        for target in [uri] + self.documents.dependents(uri):
            checked = self.documents.check(target)
            if checked is None:
                continue
            self.text_document_publish_diagnostics(T.PublishDiagnosticsParams(
                uri=target, version=checked.version, diagnostics=checked.diagnostics()))


def make_server(debounce: float = 0.15) -> TasmServer:
    server = TasmServer(debounce)

    @server.feature(T.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: TasmServer, params: T.DidOpenTextDocumentParams):
        ls.publish(params.text_document.uri)

    @server.feature(T.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: TasmServer, params: T.DidChangeTextDocumentParams):
        ls.schedule(params.text_document.uri)

    @server.feature(T.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: TasmServer, params: T.DidSaveTextDocumentParams):
        ls.publish(params.text_document.uri)

    @server.feature(T.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: TasmServer, params: T.DidCloseTextDocumentParams):
        ls.documents.forget(params.text_document.uri)
        ls.text_document_publish_diagnostics(T.PublishDiagnosticsParams(
            uri=params.text_document.uri, diagnostics=[]))

    @server.feature(T.TEXT_DOCUMENT_HOVER)
    def hover(ls: TasmServer, params: T.HoverParams):
        return navigate.hover(ls.documents.current(params.text_document.uri), params.position)

    @server.feature(T.TEXT_DOCUMENT_COMPLETION,
                    T.CompletionOptions(trigger_characters=[".", " ", ",", '"']))
    def completion(ls: TasmServer, params: T.CompletionParams):
        return complete.items(ls.documents.current(params.text_document.uri), params.position)

    @server.feature(T.TEXT_DOCUMENT_DEFINITION)
    def definition(ls: TasmServer, params: T.DefinitionParams):
        return navigate.definition(ls.documents.current(params.text_document.uri), params.position)

    @server.feature(T.TEXT_DOCUMENT_REFERENCES)
    def references(ls: TasmServer, params: T.ReferenceParams):
        uri = params.text_document.uri
        return navigate.references(ls.documents.current(uri), params.position,
                                   params.context.include_declaration, ls.documents.includers(uri))

    @server.feature(T.TEXT_DOCUMENT_PREPARE_RENAME)
    def prepare_rename(ls: TasmServer, params: T.PrepareRenameParams):
        return navigate.prepare_rename(ls.documents.current(params.text_document.uri), params.position)

    @server.feature(T.TEXT_DOCUMENT_RENAME)
    def rename(ls: TasmServer, params: T.RenameParams):
        return navigate.rename(ls.documents.current(params.text_document.uri), params.position,
                               params.new_name)

    @server.feature(T.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
    def document_symbols(ls: TasmServer, params: T.DocumentSymbolParams):
        return navigate.outline(ls.documents.current(params.text_document.uri))

    @server.feature(T.TEXT_DOCUMENT_FORMATTING)
    def formatting(ls: TasmServer, params: T.DocumentFormattingParams):
        return navigate.formatting(ls.documents.current(params.text_document.uri))

    @server.feature(T.TEXT_DOCUMENT_SEMANTIC_TOKENS_FULL, highlight.LEGEND)
    def semantic_tokens(ls: TasmServer, params: T.SemanticTokensParams):
        return highlight.semantic_tokens(ls.documents.current(params.text_document.uri))

    @server.feature(T.TEXT_DOCUMENT_INLAY_HINT)
    def inlay_hints(ls: TasmServer, params: T.InlayHintParams):
        return navigate.inlay_hints(ls.documents.current(params.text_document.uri), params.range)

    return server
