fn main() {
    let sb = pdctl_sandbox::Sandbox::start().unwrap();
    sb.write_unit("hello.service", "[Service]\nExecStart=/bin/sh -c 'echo hello-from-unit; exec sleep 100'\n").unwrap();
    sb.daemon_reload().unwrap();
    sb.systemctl(&["start", "hello.service"]).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let o = sb.journalctl(&["-o", "json", "--all"]).unwrap();
    println!("{}", String::from_utf8_lossy(&o.stdout));
    let o = sb.systemctl(&["status", "hello.service"]);
    println!("{:?}", o.map(|o| String::from_utf8_lossy(&o.stdout).to_string()));
    println!("{}", std::fs::read_to_string(format!("/proc/{}/cgroup", sb.init_pid())).unwrap());
}
