"""Reading the state of ggml's connection to an RPC server without /proc (issue 33): the
descriptors are listed from /proc/self/fd or /dev/fd (macOS), sockets found with fstat, the
state read with the platform's socket option and put in Linux's numbering."""
import os
import socket

import pytest

from ggml_py import _rpc_liveness


def test_state_queries_per_platform():
    assert _rpc_liveness.tcp_state_query("linux") == (11, None)          # TCP_INFO
    option, to_linux = _rpc_liveness.tcp_state_query("darwin")
    assert option == 0x106                                            # TCP_CONNECTION_INFO
    assert to_linux[4] == 1 and to_linux[5] == 8     # ESTABLISHED, CLOSE_WAIT (tcp_fsm.h)
    assert sorted(to_linux) == list(range(11)) and len(set(to_linux.values())) == 11
    assert _rpc_liveness.tcp_state_query("win32") is None
    if hasattr(socket, "TCP_INFO"):
        assert socket.TCP_INFO == 11


@pytest.fixture
def connection():
    """A real loopback TCP connection: (the client socket, the server's accepted socket, port)."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    cli = socket.create_connection(("127.0.0.1", port))
    acc, _ = srv.accept()
    srv.close()
    yield cli, acc, port
    cli.close()
    acc.close()


def _no_proc(monkeypatch):
    """This process as on macOS: /proc cannot be listed."""
    real = os.listdir

    def listdir(path="."):
        if str(path).startswith("/proc"):
            raise FileNotFoundError(path)
        return real(path)
    monkeypatch.setattr(os, "listdir", listdir)


@pytest.mark.parametrize("proc", [True, False], ids=["proc", "no-proc"])
def test_established_then_close_wait(connection, monkeypatch, proc):
    if _rpc_liveness.tcp_state_query(__import__("sys").platform) is None:
        pytest.skip("no TCP state query on this platform")
    cli, acc, port = connection
    if not proc:
        if not os.path.isdir("/dev/fd"):
            pytest.skip("no /dev/fd here")
        _no_proc(monkeypatch)
    _rpc_liveness._SOCKETS.pop(("127.0.0.1", port), None)
    assert _rpc_liveness._connection_states("127.0.0.1", port) == {1}      # scanned
    assert ("127.0.0.1", port) in _rpc_liveness._SOCKETS
    assert _rpc_liveness._connection_states("127.0.0.1", port) == {1}      # the remembered fd
    acc.close()                                                        # the server goes
    import time
    for _ in range(100):
        if _rpc_liveness._connection_states("127.0.0.1", port) == {8}:
            break
        time.sleep(0.01)
    assert _rpc_liveness._connection_states("127.0.0.1", port) == {8}      # CLOSE_WAIT


def test_nothing_connected_is_an_empty_set():
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        assert _rpc_liveness._connection_states("127.0.0.1", port) in (set(), None)
