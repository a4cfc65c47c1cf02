// A session just started: look again a few times a second, until the server sends the page on to its run.
setTimeout(() => location.reload(), 300);
