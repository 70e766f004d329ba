"""The `dev` fixture gives the device its test id names: an RPC id is a session server's RPC
device, reached over its own endpoint, and a local id is that local device. Without this, a
fixture that handed CPU to every RPC test would leave the whole device-parametrized suite green
(it did: 157 RPC-parameter tests passed on CPU) while testing no RPC at all."""
import ggml_py as gg
from support import RPC_IDS


def test_dev_is_the_device_its_id_names(request, dev, rpc_servers):
    name = request.node.callspec.params["dev"]
    if name in RPC_IDS:
        server = rpc_servers[RPC_IDS.index(name)]
        assert dev.registry.name.startswith("RPC"), (name, dev.registry.name)
        assert dev.type != "cpu" or dev.registry.name != "CPU"
        # the server's endpoint is what ggml's RPC device describes (its description)
        assert server.endpoint in dev.description, (server.endpoint, dev.description)
        # and the two RPC ids are two servers, not one twice
        others = [s for s in rpc_servers if s is not server]
        assert all(o.endpoint not in dev.description for o in others)
    else:
        assert dev.registry.name == gg.device(name).registry.name
        assert dev.name == name
