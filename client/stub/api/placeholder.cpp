// placeholder until the stub runtime lands
