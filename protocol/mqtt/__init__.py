"""MQTT 5 without I/O, for every client of the project that speaks it itself.

One core for both roles a client of the broker plays (docs/mqtt-client.md): the collector
subscribes with it (``collector.mqtt``), the fleet's scale mode publishes with it
(``fleet.scale_publisher``), and so do the tests' publisher and the benchmarks. The agent
publishes through aiomqtt instead (docs/design.md, convention 15) and reads only the reason
codes from here.

* :mod:`protocol.mqtt.reasons` - the table of reason codes: names, "not now", permanent refusals.
* :mod:`protocol.mqtt.packets` - single packets, stateless: Variable Byte Integers,
  properties, each packet a client writes or reads.
* :mod:`protocol.mqtt.states` - the roles, the states and the one table of what moves a
  connection from one state to the next.
* :mod:`protocol.mqtt.events` - what a session hands over: deliveries, acknowledgements,
  events, and the tokens that name a message.
* :mod:`protocol.mqtt.session` - the protocol of one client across its connections: bytes
  in, deliveries and events out; packets out.

Nothing is imported here, so that a device that needs only the reason codes loads only them.
"""

__all__ = ["events", "packets", "reasons", "session", "states"]
