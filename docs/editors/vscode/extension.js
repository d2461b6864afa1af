// Starts `tpuasm lsp` (stdio) for .tasm files; everything else is the server's work.
const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const [command, ...args] = vscode.workspace.getConfiguration("tpuasm").get("server.command");
  const server = { command, args, transport: 0 /* stdio */ };
  client = new LanguageClient("tpuasm", "tpuasm language server", server, {
    documentSelector: [{ scheme: "file", language: "tasm" }, { scheme: "untitled", language: "tasm" }],
  });
  context.subscriptions.push(client);
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
