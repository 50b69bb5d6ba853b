// `java stack/cassandra/SetTombstoneThreshold.java PID [N]`: prints the running Cassandra's
// tombstone_failure_threshold and, with N, sets it (StorageService over the JVM's local JMX
// agent, attached by pid; no JMX port is opened). tests/relay_tombstones.rs lowers it for its
// run on the dev stack and puts it back.
import com.sun.tools.attach.VirtualMachine;
import javax.management.Attribute;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnector;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;

public class SetTombstoneThreshold {
    public static void main(String[] args) throws Exception {
        VirtualMachine vm = VirtualMachine.attach(args[0]);
        String address = vm.startLocalManagementAgent();
        vm.detach();
        try (JMXConnector c = JMXConnectorFactory.connect(new JMXServiceURL(address))) {
            MBeanServerConnection m = c.getMBeanServerConnection();
            ObjectName ss = new ObjectName("org.apache.cassandra.db:type=StorageService");
            Object old = m.getAttribute(ss, "TombstoneFailureThreshold");
            if (args.length > 1) {
                m.setAttribute(ss, new Attribute("TombstoneFailureThreshold", Integer.parseInt(args[1])));
            }
            System.out.println(old);
        }
    }
}
